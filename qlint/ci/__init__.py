"""What a CI gate needs around the analysis: configuration, suppressions, baselines,
output formats and the terminal report. Torch-free."""
