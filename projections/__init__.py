"""gateway_ledger.projections"""
