"""Standard-library helpers that runtime code (patches, verify) imports: nothing heavy loads here."""
