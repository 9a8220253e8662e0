SELECT phrase FROM MASKED('It''s the [MASK] -- not a comment /* nor this */') WHERE phrase = '' OR phrase = 'two
lines' OR phrase = 'Θεσσαλονίκη'
