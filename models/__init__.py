"""What edge, cloud and training share about microclassifiers: specs, architectures, datasets, training, evaluation."""
