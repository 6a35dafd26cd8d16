"""gateway-ledger: the session and delivery layer of a chat-agent gateway."""
