"""The Kafka side: topic layout, the record handler and the consume/produce loops."""
