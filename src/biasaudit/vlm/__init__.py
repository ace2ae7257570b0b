"""VLM audit (Method B): source photos, FOCUS counterfactuals, REFLECT decisions and their analysis."""
