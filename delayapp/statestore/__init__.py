"""The read model, partitioned and on disk: each worker keeps the record states of the
``record-states`` partitions it owns, and any worker answers for any record by routing.

* :mod:`~delayapp.statestore.disk`: the owned states in RocksDB (ids and times, never a
  payload), with each partition's next offset written in the same batch as its states, so a
  restarted worker resumes where its store stopped instead of reading the topic again;
* :mod:`~delayapp.statestore.routing`: which worker owns which partition (a consumer group
  whose members advertise their web address, as Faust's table routing does) and the
  partition of a record id;
* :mod:`~delayapp.statestore.service`: the reader that keeps the store in step with the
  partitions this worker owns;
* :mod:`~delayapp.statestore.peering`: what workers sign with the peer secret (requests,
  answers, members' addresses, the owner table) and where peers may be;
* :mod:`~delayapp.statestore.remote`: asking the owner of a partition (signed, never a token).

The topic stays the source of truth: the store is a cache of it, and a worker without one
builds it from the topic.
"""
