"""gateway_ledger.domain"""
