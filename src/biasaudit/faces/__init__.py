"""Face detection, skin segmentation, skin colour (CIELAB) and embeddings for the `faces` stage."""
