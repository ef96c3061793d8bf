"""The session reasoner: a deterministic turn loop over context providers, with server tools,
client-tool hand-off and verified re-entry. Pure: no Ray, no storage of its own."""
