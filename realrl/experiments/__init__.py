"""Layer 3: one file per algorithm, turning its config into a list of MFCDef."""
