"""FilterForward edge node runtime: sources, base DNN, MC bank, smoothing, encoding, sinks."""
