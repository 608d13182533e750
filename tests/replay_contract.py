"""What DESIGN.md's replay JSON contract promises of each rule's verdict."""

VERDICT_KEYS = {
    "fired",
    "status",
    "datapoints",
    "measured",
    "first_fired_at",
    "alerts",
    "affected",
}
UNIT_KEYS = {"labels", "first_at", "last_at", "worst"}
