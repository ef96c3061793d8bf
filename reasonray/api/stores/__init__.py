"""What the API keeps besides sessions and memories: the agent registry and the A2A task store."""
