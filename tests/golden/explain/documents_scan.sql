SELECT id, title, meta.source FROM DOCUMENTS WHERE title LIKE 'Sa%' LIMIT 10
