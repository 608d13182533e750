"""The rule catalog and the compiler from SageMaker-style configuration to PromQL."""
