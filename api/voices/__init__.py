"""The voice library service: custom voices added, mixed, deleted and given back."""
