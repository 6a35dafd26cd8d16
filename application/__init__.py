"""gateway_ledger.application"""
