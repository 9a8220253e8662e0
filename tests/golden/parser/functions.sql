SELECT count(*), LENGTH(phrase), lower(doc.title), now() FROM MASKED('[MASK]') WHERE Upper(phrase) = upper('x')
