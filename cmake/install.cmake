# Install rules and the Debian package (`make install`, `make deb`; docs/building.md).
#
#   bin/twice                                  the binary
#   share/man/man1/twice.1, man5/twice.conf.5  the manual (dist/, written by hand in roff)
#   share/bash-completion/completions/twice    bash completion (dist/twice.bash)
#   lib/systemd/system/twice.service           the unit (dist/twice.service.in), not enabled
#   lib/sysusers.d/twice.conf                  the `twice` system user, for systemd-sysusers
#   SYSCONFDIR/twice/twice.conf                the commented default configuration
#
# Paths follow GNUInstallDirs: with the default prefix /usr/local the configuration goes to
# /usr/local/etc/twice; with -DCMAKE_INSTALL_PREFIX=/usr (what `make deb` builds) to /etc/twice.
# The journal of the default configuration and the unit's StateDirectory is /var/lib/twice
# whatever the prefix: systemd creates state directories there.
include(GNUInstallDirs)

set(TWICE_DIST ${CMAKE_SOURCE_DIR}/dist)
set(TWICE_CONF_DIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/twice)
set(TWICE_CONF ${TWICE_CONF_DIR}/twice.conf)
set(TWICE_BIN_PATH ${CMAKE_INSTALL_FULL_BINDIR}/twice)

configure_file(${TWICE_DIST}/twice.service.in ${CMAKE_BINARY_DIR}/dist/twice.service @ONLY)

install(TARGETS twice RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${TWICE_DIST}/twice.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${TWICE_DIST}/twice.conf.5 DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)
install(FILES ${TWICE_DIST}/twice.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME twice)
install(FILES ${CMAKE_BINARY_DIR}/dist/twice.service DESTINATION lib/systemd/system)
install(FILES ${TWICE_DIST}/twice.sysusers DESTINATION lib/sysusers.d RENAME twice.conf)
# The configuration is the user's once installed: `make install` over an existing one leaves it
# and puts the shipped default beside it as twice.conf.default (the package's is a conffile,
# which dpkg asks about instead).  file(INSTALL) adds DESTDIR itself; EXISTS does not.
install(CODE "
  if(EXISTS \"\$ENV{DESTDIR}${TWICE_CONF}\")
    message(STATUS \"Keeping the existing \$ENV{DESTDIR}${TWICE_CONF}: the default is in twice.conf.default\")
    file(INSTALL DESTINATION \"${TWICE_CONF_DIR}\" TYPE FILE RENAME twice.conf.default
         FILES \"${TWICE_DIST}/twice.conf\")
  else()
    file(INSTALL DESTINATION \"${TWICE_CONF_DIR}\" TYPE FILE FILES \"${TWICE_DIST}/twice.conf\")
  endif()")

# ---- the Debian package: cpack -G DEB in a tree configured with the prefix /usr -------------
# CPack's DEB generator writes the .deb itself (ar and tar, files owned by root), so neither
# debhelper nor fakeroot is needed; dpkg-shlibdeps (dpkg-dev) computes the libraries' packages.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME twice)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "twice developers <twice@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fault-injecting proxy for message brokers")
# The summary is the control file's first Description line, this text the extended one.
set(CPACK_PACKAGE_DESCRIPTION
    "twice sits between an application's workers and a real broker (RabbitMQ over
AMQP 0-9-1, Redis with Sidekiq, Celery, RQ, Streams, BullMQ or plain-list
jobs), injects the faults of at-least-once delivery (redeliveries, duplicates,
expired and lost acks, delays, stream faults) as its rule files say, journals
every event, and `twice verdict` says which task handlers did their side
effect twice.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# adduser: postinst creates the system user.  The libraries come from dpkg-shlibdeps.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "rabbitmq-server | redis-server")
configure_file(${TWICE_DIST}/debian/conffiles.in ${CMAKE_BINARY_DIR}/dist/debian/conffiles @ONLY)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_BINARY_DIR}/dist/debian/conffiles ${TWICE_DIST}/debian/postinst
    ${TWICE_DIST}/debian/prerm ${TWICE_DIST}/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR})
include(CPack)
