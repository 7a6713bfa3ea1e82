"""Media encoding and decoding shared by the API families (audio now; images and video later)."""
