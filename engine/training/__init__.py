"""Everything torch: the training loop, models, data, precision plans, the numerics probe,
multi-process wrapping and the oneDNN capture. Imported only by trainer processes."""
