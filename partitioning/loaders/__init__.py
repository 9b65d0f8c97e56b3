"""One module per input kind; ``partitioning.sources.LOADERS`` maps each kind to its loader."""
