"""The Spark schema of the audit topic is derived from the audit contract (no JVM needed)."""

from __future__ import annotations

from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType

from delayapp.core.audit import WIRE_FIELDS, AuditEvent
from delayapp.pipelines.audit_report import AUDIT_SCHEMA


def test_the_schema_has_every_field_of_the_contract_in_its_order() -> None:
    assert AUDIT_SCHEMA.fieldNames() == [name for name, _ in WIRE_FIELDS]
    assert {"priority", "delayed_at", "throttled_until", "source"} <= set(AUDIT_SCHEMA.fieldNames())
    assert AUDIT_SCHEMA.fieldNames()[: len(AuditEvent.__dataclass_fields__)] == list(AuditEvent.__dataclass_fields__)


def test_the_schema_types_follow_the_declared_wire_types() -> None:
    types = {f.name: f.dataType for f in AUDIT_SCHEMA.fields}
    assert types["status"] == StringType() and types["priority"] == BooleanType()
    assert types["retries"] == types["hops"] == types["partition"] == IntegerType()
    assert types["at"] == types["seq"] == types["offset"] == types["delayed_at"] == LongType()
    assert all(f.nullable for f in AUDIT_SCHEMA.fields), "events written before a field existed lack it"
