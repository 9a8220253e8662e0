SELECT phrase, score
FRM MASKED('x [MASK]')
