"""Training-data tools: MCTS step records for the PRM and rejection-sampled SFT data (RFT)."""
