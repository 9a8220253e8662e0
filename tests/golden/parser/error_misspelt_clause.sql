SELECT phrase
FROM MASKED('x [MASK]')
ORDR BY score
