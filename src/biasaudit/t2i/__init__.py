"""Text-to-image audit (Method A): benchmarks, prompts, generation, classification and analysis."""
