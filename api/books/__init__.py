"""Books as durable speech jobs: read a book, synthesize it chapter by chapter, resume after a crash."""
