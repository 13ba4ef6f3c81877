"""What the tests share: paths, the CLI runner, real artefacts, sample documents, training jobs, readers."""
