SELECT phrase FROM MASKED('[MASK]') WHERE phrase NOT 'x'
