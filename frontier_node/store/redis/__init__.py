"""The Redis store of a frontier node: one Cluster slot per registrable domain, every write fenced by ring epoch.

`store` holds RedisStore (buffering, flush, reads, fencing, handoff), `codec` the key names and the stored
forms of rows, journal lines and robots records, `scripts` the Lua scripts and how they are run.
"""

from frontier_node.store.redis.codec import EXPORT_FORMAT
from frontier_node.store.redis.handoff import AdoptedDomain, FencedOut
from frontier_node.store.redis.store import RedisClient, RedisStore

__all__ = ["EXPORT_FORMAT", "AdoptedDomain", "FencedOut", "RedisClient", "RedisStore"]
