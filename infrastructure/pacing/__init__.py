"""The rows through which gateways of one store share their platforms' rate budgets."""
