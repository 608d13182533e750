"""Training health: the tensor reductions SageMaker Debugger's tensor rules decide on."""
