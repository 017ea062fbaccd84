"""The ground floor: file and batch formats every other room reads (FunASR and HF model folders, run folders,
the Batch that flows from collation to the model). Imports nothing of brisk but brisk.errors."""
