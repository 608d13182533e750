"""The shared contract: the metric table, names, durations, the sample-to-series path,
the recording format, validation and the HTTP server every port uses."""
