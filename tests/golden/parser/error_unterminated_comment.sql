SELECT phrase /* oops FROM MASKED('[MASK]')
