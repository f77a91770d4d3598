"""Frontend: capture (torch.export / Dynamo) and lowering of ATen graphs to the IR."""
