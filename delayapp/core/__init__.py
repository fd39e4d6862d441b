"""Pure core of delayapp: no Kafka, no clocks, no I/O.

Everything here is a plain function or an immutable value so it can be unit- and
property-tested with a fixed clock: durations, the denomination ladder, the exact
hop planner, the header codec and the governance policies.
"""
