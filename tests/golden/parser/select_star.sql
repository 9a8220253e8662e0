select * from masked('a [MASK] b')
