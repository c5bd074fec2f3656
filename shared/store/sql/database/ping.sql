-- Whether the database answers.
SELECT 1
