-- Run once by the mariadb image on first start (after MARIADB_USER is created).
-- Lets the lockcore user see and KILL other sessions (fault-injection tests).
GRANT PROCESS, CONNECTION ADMIN ON *.* TO 'lockcore'@'%';
-- A password with +, space, @ and %, for the URL-decoding tests.
CREATE USER IF NOT EXISTS 'lockcore_plus'@'%' IDENTIFIED BY 'p+q r@s%t';
GRANT ALL PRIVILEGES ON lockcore.* TO 'lockcore_plus'@'%';
-- An account allowed 6 connections, for the test of the limit.
CREATE USER IF NOT EXISTS 'lockcore_few'@'%' IDENTIFIED BY 'lockcore';
ALTER USER 'lockcore_few'@'%' WITH MAX_USER_CONNECTIONS 6;
GRANT ALL PRIVILEGES ON lockcore.* TO 'lockcore_few'@'%';
