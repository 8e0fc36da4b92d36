"""Theory: the paper's results as code. timing_model (Theorem 7's speedup, Theorem 17's backup choice), fan_out
(uniform and Theorem 12's geometric fan-out, the miss-rate fit), acceptance (greedy SD / SSD rounds replayed from
teacher-forced draft ranks) and exactness (what greedy exactness means per precision, and its check).
"""
