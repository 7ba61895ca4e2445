"""Text processing: split input into pieces, phonemize them, cut phonemes into model-sized chunks."""
