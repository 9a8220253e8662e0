/* leading block
comment */ SELECT phrase -- the answer
, score /* inline */ FROM MASKED('[MASK]') -- trailing
-- last line
