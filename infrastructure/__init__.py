"""gateway_ledger.infrastructure"""
