"""Simulated chat platforms and gateway workers for ``gateway-ledger simulate`` and tests."""
