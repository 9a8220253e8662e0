SELECT score * 2 + support / 3 - -1 AS s, -score, - -score, -(2), -(-2), 2 - (3 - 4), (1 + 2) * 3 FROM MASKED('[MASK]') ORDER BY score * support DESC, -length(phrase)
