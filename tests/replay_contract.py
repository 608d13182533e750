"""What DESIGN.md's replay JSON contract promises of each rule's verdict."""

VERDICT_KEYS = {"fired", "status", "datapoints", "measured", "first_fired_at", "alerts"}
