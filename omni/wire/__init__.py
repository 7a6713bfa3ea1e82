"""What crosses a process boundary, used by both sides of every socket.

- `protocol`: the control-plane messages between the orchestrator and engine processes
  (ZeroMQ ROUTER/DEALER), their encoding and the socket setup;
- `payloads`: references to tensors and bytes on the payload plane, and an engine
  process's side of it (`PayloadPlane`); the front end's is omni/runtime/client_payloads.py;
- `transit`: the send-time stamps every message carries, and how a hop is timed;
- `curve`: ZeroMQ CURVE keys for sockets that leave the host;
- `arrays`: numpy arrays inside request inputs, as msgpack carries them.

Nothing here imports torch at module level: the orchestrator and the HTTP front end use
these modules too.
"""
