"""gateway_ledger.entrypoints"""
