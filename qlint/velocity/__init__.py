"""What the probe, the witness and the monitor all measure, on the floor below them: a block's velocity as a
function of X_k (:mod:`.field`) and the paper's forward and backward bounds built from measured constants
(:mod:`.bounds`, Remark 6)."""
