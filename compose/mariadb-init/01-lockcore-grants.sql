-- Run once by the mariadb image on first start (after MARIADB_USER is created).
-- Lets the lockcore user see and KILL other sessions (fault-injection tests).
GRANT PROCESS, CONNECTION ADMIN ON *.* TO 'lockcore'@'%';
