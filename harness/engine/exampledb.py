"""A Hypothesis example database shared between runs and machines, on a Redis server.  Off by default.

Hypothesis saves every failing example it finds to its database and replays those first the next time the same
property runs.  Pointed at a Redis server (``--example-db redis://HOST:PORT/DB`` or ``HARNESS_EXAMPLE_DB``), a
failure one machine found is replayed first by every other.  Hypothesis's own classes do the work:

* ``--example-db`` alone (the CI runners' setting): `MultiplexedDatabase` of `ReadOnlyDatabase` over
  `RedisExampleDatabase` and a `DirectoryBasedExampleDatabase` of this machine: the shared examples are read,
  what this run finds is written here only;
* with ``--example-db-write`` (``HARNESS_EXAMPLE_DB_WRITE=1``: the machines that publish, e.g. main's nightly
  thorough run): the Redis database is written as well.

Keys are scoped by the implementation checked (``HARNESS_EXAMPLE_DB_SCOPE``, set by the executor for each
implementation's checking process): a property's key is the same for every implementation, and Hypothesis
deletes an example that no longer fails, so without the scope a correct implementation would erase the failures
a buggy one left.  Entries expire after `EXPIRE_AFTER` without a run of their property (Redis's own TTL, as
`RedisExampleDatabase` sets it).  The local copy goes to ``HARNESS_EXAMPLE_DB_LOCAL``, else ``examples/`` in the
results folder (git-ignored).

Every profile uses the database when one is set, ``ci`` included: ci is derandomized, so a replayed example is
the only way a failure found elsewhere (by ``thorough``, say) reaches a ci run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from datetime import timedelta

from hypothesis.database import ExampleDatabase

from llm_inference_harness.engine import environment

URL = "HARNESS_EXAMPLE_DB"
WRITE = "HARNESS_EXAMPLE_DB_WRITE"
LOCAL = "HARNESS_EXAMPLE_DB_LOCAL"
SCOPE = "HARNESS_EXAMPLE_DB_SCOPE"
EXPIRE_AFTER = timedelta(days=8)  # RedisExampleDatabase's default: examples persist between weekly runs
KEY_PREFIX = b"harness-example:"


def enabled() -> bool:
    return bool(os.environ.get(URL))


def configure(url: str | None, write: bool) -> None:
    """The command line's flags, as the environment every checking process (and Ray node) inherits; the server
    is pinged once here, so that a wrong address is a usage error and not a failure in every process."""
    if not url:
        return
    connect(url)
    os.environ[URL] = url
    if write:
        os.environ[WRITE] = "1"


def connect(url: str):
    try:
        import redis
    except ImportError:
        raise ValueError("--example-db needs the redis client: pip install 'llm-inference-harness[cluster]'") from None
    try:
        client = redis.Redis.from_url(url)
        client.ping()
    except (ValueError, redis.RedisError) as exc:
        raise ValueError(f"--example-db {url}: cannot use it ({exc}); expected redis://HOST:PORT/DB of a running "
                         "Redis server") from None
    return client


def from_environment() -> ExampleDatabase | None:
    """The database HARNESS_EXAMPLE_DB selects, or None (Hypothesis's profile setting stands)."""
    if not enabled():
        return None
    from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase
    from hypothesis.extra.redis import RedisExampleDatabase

    from llm_inference_harness.engine.provenance import output_root

    shared = RedisExampleDatabase(connect(environment.value(URL)), expire_after=EXPIRE_AFTER, key_prefix=KEY_PREFIX)
    local = DirectoryBasedExampleDatabase(str(environment.value(LOCAL) or output_root() / "examples"))
    writes_shared = environment.value(WRITE)
    return Scoped(MultiplexedDatabase(shared if writes_shared else ReadOnlyDatabase(shared), local))


class Scoped(ExampleDatabase):
    """``db`` with every key prefixed by the implementation this process checks (SCOPE, read at each call)."""

    def __init__(self, db: ExampleDatabase) -> None:
        super().__init__()
        self.db = db

    def __repr__(self) -> str:
        return f"Scoped({self.db!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scoped) and self.db == other.db

    def _key(self, key: bytes) -> bytes:
        return os.environ.get(SCOPE, "").encode() + b"/" + key

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.db.fetch(self._key(key))

    def save(self, key: bytes, value: bytes) -> None:
        self.db.save(self._key(key), value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.db.delete(self._key(key), value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.db.move(self._key(src), self._key(dest), value)


@contextlib.contextmanager
def scoped(target) -> Iterator[None]:
    """Within the block, checking processes started here use ``target``'s keys (None: unscoped)."""
    before = os.environ.get(SCOPE)
    if target is None:
        os.environ.pop(SCOPE, None)
    else:
        os.environ[SCOPE] = f"{target.technique}/{target.label}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SCOPE, None)
        else:
            os.environ[SCOPE] = before
