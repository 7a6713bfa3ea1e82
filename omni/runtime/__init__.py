"""The orchestrator's side: orchestrator, routing, lead control, request state, pool,
launcher, the client half of the payload plane, transit accounting. Nothing under
omni/engines imports from here."""
