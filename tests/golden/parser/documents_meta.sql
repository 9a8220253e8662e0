SELECT id FROM DOCUMENTS() WHERE doc.meta.year BETWEEN 1990 AND 2000 AND doc.meta.lang IN ('en', 'el') AND doc.meta.editor IS NOT NULL ORDER BY id OFFSET 5
