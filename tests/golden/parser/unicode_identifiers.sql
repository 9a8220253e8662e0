SELECT phrase AS réponse FROM MASKED('[MASK]') WHERE doc.meta.année > 2000
