-- Whether an organization exists (`palisade schedule add` explains a refused insert with it).
-- $1: id
SELECT EXISTS (SELECT 1 FROM organizations WHERE id = $1)
