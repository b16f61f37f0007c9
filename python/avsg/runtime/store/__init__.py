"""KV stores: ``device`` (all KV on the device), ``offload`` (copy every selection), ``avsg``
(one SparseKVBuffer per layer, copy only misses). Importing this package registers them."""
from . import avsg, device, offload  # noqa: F401  (register_store)
